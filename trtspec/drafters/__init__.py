"""Drafter kinds: one module per kind, one frozen record (``base.DrafterKind``) each, and the registry.

Ask ``registry`` for a kind (``get``, ``names``, ``detect``); never test a kind's name elsewhere.
"""
