"""Roles more than one track uses: the agent policy and the user simulator (a track's own live in ``synthesis/<track>/roles``)."""
