"""Spate's chaos suite (issue 13): fault injection on real processes and Jepsen-style history
checking. So far: a Toxiproxy-compatible proxy server (chaos.toxiproxy, its toxics in
chaos.toxics)."""
