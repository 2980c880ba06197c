#version 450
#extension GL_GOOGLE_include_directive : require
// moe_rows_gateup_q4_desc: grouped MoE gate+up for lists grouped by expert (prompt chunks), a row per lane. See moe_rows.glsl.
#define GATEUP
#define QBITS 4
#include "moe_rows.glsl"
