"""The core passes: dead-code elimination, in-place removal, no-op removal."""
