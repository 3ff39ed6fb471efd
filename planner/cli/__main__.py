"""`python -m planner.cli`: the `planner` command (the tests run the CLI this way)."""

from . import main

if __name__ == "__main__":
    main()
