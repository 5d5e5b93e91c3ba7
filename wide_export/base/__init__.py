"""Plumbing every layer uses: errors, names of the files we write, confined paths, signals, progress, child
processes, output folders, early input checks, the API-key middleware both OpenAI servers use. Imports nothing else of wide_export (docs/architecture.md)."""
