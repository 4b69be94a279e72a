"""Accounts (`--auth local|oidc`): sign-in, passwords, invites, per-account API keys, OpenID Connect, and the
`pagedchat users` command."""
