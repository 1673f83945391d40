"""Extensions defined outside the package, as a user would write them (registered on import)."""
