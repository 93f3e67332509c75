#!/bin/bash
# RESULTS §59: A = 46272a8 (before ADR 0048), B = working tree; 5 W1 runs per cluster
./ab1.sh spate-gateway 16384 3 /tmp/q59/ab2-gw16k 20000
./ab1.sh spate-gateway 1024 2 /tmp/q59/ab2-gw1k 100000
./ab1.sh spate-direct 16384 2 /tmp/q59/ab2-dir16k 20000
echo ALLDONE > /tmp/q59/ab2.done
