"""Export formats, trainer presets, the manifest and where the files go."""
