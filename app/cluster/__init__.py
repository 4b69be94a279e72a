"""Replicas on Ray Serve: engine replicas in a Serve deployment, routed by the KV blocks each one holds.

`pagedchat serve --replicas N` keeps the HTTP surface in its own process (the ingress: one set of rate limits, turn
locks and admin feed) and runs N `LLMEngine`s as replicas of the `EngineReplica` deployment; `ReplicaSetEngine`
gives the app the same interface as the in-process `AsyncEngine`. Ray is an optional extra (`pagedchat[cluster]`):
nothing here is imported unless replicas are asked for.
"""
