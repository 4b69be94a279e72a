"""`pagedchat bench serving`: one OpenAI-API load against pagedchat and a baseline server."""
