"""aotc package."""
