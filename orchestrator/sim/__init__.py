"""orch-sim: a stdlib-only simulator of `python -m sglang.launch_server` for testing orch without a GPU."""
