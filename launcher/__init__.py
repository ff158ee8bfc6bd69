"""Starts cache, worker, scheduler and gateway as separate processes (local mode)."""
