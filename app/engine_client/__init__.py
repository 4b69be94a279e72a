"""The engine client: the one interface the app has to the engine (`protocol.py`), the in-process bridge that
steps an `LLMEngine` on its own thread (`async_engine.py`), and the streams its outputs arrive on."""
