"""EigenData track (issue 6, EigenData §4-5): domain-pack instances, workers and their stages.

So far: ``verification`` -- the VerificationFunction worker's rules backend (generated,
sandbox-run ``verify`` functions) and ``build_instance`` (one interactive instance of a pack).
"""
