"""Reports of a diagnosis: terminal (header + table), JSON (versioned schema) and Markdown."""
