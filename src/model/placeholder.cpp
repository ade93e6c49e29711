// Placeholder so the component library has a source; replaced as the component grows.
