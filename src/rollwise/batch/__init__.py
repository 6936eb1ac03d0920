"""Building the trainer's batch: filtering, shaping, advantages, collation."""
