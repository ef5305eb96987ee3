"""The LLM gateway: every LLM step of every stage is a typed, versioned role.

``core`` holds the vocabulary (Role, Backend Protocol, Answer, errors),
``roles`` the role definitions per track, ``rules`` the offline rule-based
synthesiser behind the default ``rules`` backend, ``backends`` the backends and
``gateway`` the part stages call (rendering, validation, retries, cache).
"""
