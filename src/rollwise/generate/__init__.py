"""Generation-time interventions (stage S2 of allocation.md §0.4): strategies that change, stop or
schedule rollouts while they are being generated. ``arrol``: online rollout pruning (ARRoL,
``sampling.arrol``); ``latr``: tree rollouts (LATR, ``sampling.latr``); ``etmr`` and ``ec_tree``: entropy
trees (ETTRL's ETMR, ``sampling.etmr``; ECHO's EC-Tree, ``sampling.ec_tree``), on the fork machinery they
share with LATR (``forks``); ``april``: active partial
rollouts (APRIL, ``replay.name = "april"``); ``spec_rl``: speculative rollouts reusing the previous
epoch's responses (SPEC-RL, ``replay.name = "spec_rl"``); ``sol_rl``: an FP8 candidate pool and its
re-scored contrastive subset (Sol-RL, ``sampling.sol_rl``); ``episodes``: multi-turn episodes. ``common``:
what every generator shares, below the pools that drive them (``StepCost``, ``merge_groups``; issue #41)."""
