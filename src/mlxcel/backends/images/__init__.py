"""Image engines: diffusers (torch) everywhere, mflux on Apple Silicon."""
