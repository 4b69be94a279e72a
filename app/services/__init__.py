"""The service layer: the engine bridge, session chat and replies, limits, metrics; no HTTP objects, no SQL."""
