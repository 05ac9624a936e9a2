"""Pure scheduling: per-worker state and batch formation, dispatch and global policies."""
