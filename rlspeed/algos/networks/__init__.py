"""The MLP that DQN and VPG share, one module per backend, with the same layers, init and
parameter names on both (flax's ``Dense_i``, torch's ``net.<i>``), so weights carry over;
and, for torch, the init and optimizers every torch learner (TD3 too) builds with."""
