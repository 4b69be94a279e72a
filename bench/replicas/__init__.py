"""`pagedchat bench multiturn --replicas N`: replica sets on Ray Serve per routing policy, Ray's overhead, a
failover."""
