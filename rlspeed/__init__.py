"""rlspeed: fast RL training tool."""
