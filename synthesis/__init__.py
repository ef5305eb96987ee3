"""What each track computes, free of Kafka: one folder per track, its roles included.

``streams/<track>/`` holds one thin module per stage (decode, call this library, emit); the
``rules`` simulator answers the roles defined here. Nothing here imports ``streams``.
"""
