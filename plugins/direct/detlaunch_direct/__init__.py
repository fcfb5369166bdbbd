"""detlaunchs direct layer: the supervisor starts each rank itself, with torchruns environment."""
