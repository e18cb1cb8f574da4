"""rlspeed's core: the RL library (algorithms, networks, rollout and replay pieces, training
loops that yield chunks, environments, engines, backends). It imports nothing of the tool
around it (Hydra, OmegaConf, MLflow, Optuna, rich, TensorBoard, submitit; the command line,
tracking, sweeps): ``tests/test_architecture.py`` fails on such an import."""
