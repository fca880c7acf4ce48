"""The held-out validation matrix's own user model (:mod:`analysis.heldout.user_model`),
reached the way a user's model is: by file, ``FILE.py:NAME``."""
