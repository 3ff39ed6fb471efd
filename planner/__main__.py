"""`python -m planner`: the same entry point as the `planner` script, for an environment whose
scripts folder is not on PATH."""

from .cli import main

if __name__ == "__main__":
    main()
