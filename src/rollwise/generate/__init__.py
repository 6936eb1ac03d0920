"""Generation-time interventions (stage S2 of allocation.md §0.4): strategies that change or stop
rollouts while they are being generated. ``arrol``: online rollout pruning (ARRoL)."""
