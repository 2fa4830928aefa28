// Build configuration of the sum-tree kernel. One bitstream holds one (fanout, depth, precision);
// `make` / the Tcl scripts / the C-simulation builder pass these with -D.
#ifndef PEARL_SUMTREE_CONFIG_H
#define PEARL_SUMTREE_CONFIG_H

#include "sumtree.h"

#ifndef PEARL_SUMTREE_FANOUT
#define PEARL_SUMTREE_FANOUT 16
#endif
#ifndef PEARL_SUMTREE_DEPTH
#define PEARL_SUMTREE_DEPTH 5  // 16^5 = 1,048,576 leaves
#endif
#ifndef PEARL_SUMTREE_MAX_BATCH
#define PEARL_SUMTREE_MAX_BATCH 4096  // members per kernel call (on-chip I/O buffers)
#endif

#ifdef PEARL_SUMTREE_DOUBLE
typedef double sumtree_real;
#else
typedef float sumtree_real;
#endif

typedef pearl::sumtree::Tree<sumtree_real, PEARL_SUMTREE_FANOUT, PEARL_SUMTREE_DEPTH> SumTreeConfig;

#endif
