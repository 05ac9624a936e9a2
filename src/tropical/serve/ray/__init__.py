"""Our own engine's workers as Ray actors, for clusters of machines (Ray is optional: nothing here
is imported unless ``--backend ray`` asks for it)."""
