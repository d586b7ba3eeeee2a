"""What every side of a gang shares and none owns: the spec a gang is made from and its flags,
a cell's result and the hang verdict, the rules for what of the notebook's directory and
variables may travel, gang and kernel ids, and the GPU-hours meter. Below the gang, above the
wire: it imports only ``wire/`` and the errors."""
