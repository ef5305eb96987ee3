"""Tools track (ASTRA §2.1.1): tools.raw -> tools.servers, and the LanceDB tool index both other tracks search."""
