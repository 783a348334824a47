"""Training tasks behind one interface: language modelling and the nearest-neighbour target."""
