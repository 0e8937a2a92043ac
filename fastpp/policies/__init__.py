"""Chunk policies and decode balancers."""
