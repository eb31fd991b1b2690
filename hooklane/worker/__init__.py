"""The delivery worker: owns partitions, reserves, sends, records results."""
