"""rlspeed's Optuna sweeper for Hydra: ``hydra/sweeper=optuna`` on current Optuna, with pruning."""
