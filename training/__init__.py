"""Training the zoo's models: the loop (`train`) and the losses (`objectives`). Imports the engine; the engine never imports it."""
