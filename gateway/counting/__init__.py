"""Token counting (design D12): tokenizers loaded offline, the per-field counting rules and their
upper bound, the count cache, the prefix memo of each conversation, and the threads that count
off the event loop."""
