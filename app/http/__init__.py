"""What every HTTP feature shares: the services container, errors, request reading, who is calling (keys, cookies,
accounts, admin), CSRF, SSE, middleware, per-client limits and the uvicorn server. Imports no feature."""
