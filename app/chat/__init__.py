"""Session chat: sessions, branches, presets, search and export over JSON, the chat socket, and the service that
streams each reply from the engine into the store."""
