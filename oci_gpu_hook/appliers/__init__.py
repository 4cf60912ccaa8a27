"""Appliers: the one set of container edits put in place (spec rewrite, live hook, CDI)."""
