"""`planner calibrate`: learn a cluster from its own Megatron-LM logs and nccl-tests output."""
