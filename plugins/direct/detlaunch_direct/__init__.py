"""detlaunch's direct layer: the supervisor starts each rank itself, with torchrun's environment."""
