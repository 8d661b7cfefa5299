"""Cluster scope: the lab's arithmetic (pure) and three proxies sharing one rate through the real engine (integration)."""
