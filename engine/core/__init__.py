"""The engine's torch-free core: configuration, sequences, the block pool and its hash chain, the scheduler."""
