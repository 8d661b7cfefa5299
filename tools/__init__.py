"""Install and maintenance scripts; the Python ones are also importable (`tools.wasm_image`)."""
