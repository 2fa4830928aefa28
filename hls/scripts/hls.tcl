# Vitis HLS project for one PEARL kernel: C-simulation, C-synthesis, export.
# Run through hls/Makefile (`make csim-vitis`, `make csynth`, `make ip`), which sets:
#   PEARL_TOP      top function: pearl_sumtree | pearl_mlp_forward | pearl_mlp_train_step
#   PEARL_SOURCES  kernel source(s), relative to hls/
#   PEARL_TB       testbench source(s), relative to hls/
#   PEARL_PART     FPGA part, e.g. xcu250-figd2104-2L-e (Alveo U250), xczu7ev-ffvc1156-2-e (ZCU104)
#   PEARL_CLOCK_NS clock period in ns (3.33 = 300 MHz)
#   PEARL_FLOW     vitis (an .xo for v++ / XRT) or vivado (an IP for a PYNQ block design)
#   PEARL_CFLAGS   extra compiler flags (-D build options)
#   PEARL_STEPS    any of: csim csynth export
# Not run on the development machine (no Vitis there): see hls/README.md.
set top     $::env(PEARL_TOP)
set sources $::env(PEARL_SOURCES)
set tb      $::env(PEARL_TB)
set part    $::env(PEARL_PART)
set period  $::env(PEARL_CLOCK_NS)
set flow    $::env(PEARL_FLOW)
set steps   $::env(PEARL_STEPS)
set cflags  "-std=c++14 -I[pwd]/include -I[pwd]/sumtree -I[pwd]/mlp $::env(PEARL_CFLAGS)"

open_project -reset build/hls_${top}_${flow}
set_top $top
foreach src $sources { add_files $src -cflags $cflags }
foreach src $tb { add_files -tb $src -cflags "$cflags -DPEARL_USE_VITIS_HEADERS" }
open_solution -reset solution -flow_target $flow
set_part $part
create_clock -period $period -name default

if {[lsearch $steps csim] >= 0} { csim_design }
if {[lsearch $steps csynth] >= 0} { csynth_design }
if {[lsearch $steps export] >= 0} {
    if {$flow eq "vitis"} {
        export_design -format xo -output [pwd]/build/${top}.xo
    } else {
        export_design -format ip_catalog -output [pwd]/build/${top}_ip.zip
    }
}
exit
