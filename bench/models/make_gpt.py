#!/usr/bin/env python3
# Writes a GPT model file of config/models/gpt_tiny.pbtxt's shape (pre-LN
# blocks, causal attention, GELU MLP 4x wide, bytes as tokens, Adam):
#   make_gpt.py BLOCKS WIDTH HEADS CONTEXT SEQUENCES NAME DESCRIPTION [LR]
# SEQUENCES per micro-batch. bench/models/gpt_offload.pbtxt and
# tests/data/gpt_wide.pbtxt were written by it.
import sys
L,d,h,T,B,name,desc = int(sys.argv[1]),int(sys.argv[2]),int(sys.argv[3]),int(sys.argv[4]),int(sys.argv[5]),sys.argv[6],sys.argv[7]
f=4*d; tok=B*T
o=[]
o.append(f'name: "{name}"'); o.append(f'description: "{desc}"'); o.append('dataset: "text:fortunes"'); o.append(f'micro_batch: {B}')
P=lambda n,s,extra='': o.append(f'tensor {{ name: "{n}" shape: [{", ".join(map(str,s))}] role: PARAM{extra} }}')
o.append(f'tensor {{ name: "ids" shape: [{tok}] role: INPUT dtype: I32 }}')
o.append(f'tensor {{ name: "next" shape: [{tok}] role: LABEL dtype: I32 }}')
P("tok",[256,d]," init: XAVIER_UNIFORM"); P("pos",[T,d]," init: XAVIER_UNIFORM")
for b in range(L):
    p=f"b{b}"
    P(f"{p}.ln1.g",[d]," init: ONES"); P(f"{p}.ln1.b",[d])
    P(f"{p}.qkv.w",[d,3*d]," init: KAIMING_UNIFORM"); P(f"{p}.qkv.b",[3*d],f" init: LINEAR_BIAS init_fan_in: {d}")
    P(f"{p}.proj.w",[d,d]," init: KAIMING_UNIFORM"); P(f"{p}.proj.b",[d],f" init: LINEAR_BIAS init_fan_in: {d}")
    P(f"{p}.ln2.g",[d]," init: ONES"); P(f"{p}.ln2.b",[d])
    P(f"{p}.fc.w",[d,f]," init: KAIMING_UNIFORM"); P(f"{p}.fc.b",[f],f" init: LINEAR_BIAS init_fan_in: {d}")
    P(f"{p}.out.w",[f,d]," init: KAIMING_UNIFORM"); P(f"{p}.out.b",[d],f" init: LINEAR_BIAS init_fan_in: {f}")
P("lnf.g",[d]," init: ONES"); P("lnf.b",[d]); P("head.w",[d,256]," init: KAIMING_UNIFORM")
op=lambda n,t,i,out,extra='': o.append(f'op {{ name: "{n}" type: {t} input: [{", ".join(chr(34)+x+chr(34) for x in i)}] output: "{out}"{extra} }}')
op("embed","EMBEDDING",["ids","tok"],"e"); op("position","POSITION_EMBEDDING",["e","pos"],"x0")
x="x0"
for b in range(L):
    p=f"b{b}"
    op(f"{p}.ln1","LAYER_NORM",[x,f"{p}.ln1.g",f"{p}.ln1.b"],f"{p}.n1")
    op(f"{p}.qkv","MATMUL",[f"{p}.n1",f"{p}.qkv.w"],f"{p}.qkv0")
    op(f"{p}.qkv_bias","BIAS_ADD",[f"{p}.qkv0",f"{p}.qkv.b"],f"{p}.qkv1")
    op(f"{p}.attn","CAUSAL_ATTENTION",[f"{p}.qkv1"],f"{p}.a",f" heads: {h} context: {T}")
    op(f"{p}.proj","MATMUL",[f"{p}.a",f"{p}.proj.w"],f"{p}.o0")
    op(f"{p}.proj_bias","BIAS_ADD",[f"{p}.o0",f"{p}.proj.b"],f"{p}.o1")
    op(f"{p}.res1","ADD",[x,f"{p}.o1"],f"{p}.x1")
    op(f"{p}.ln2","LAYER_NORM",[f"{p}.x1",f"{p}.ln2.g",f"{p}.ln2.b"],f"{p}.n2")
    op(f"{p}.fc","MATMUL",[f"{p}.n2",f"{p}.fc.w"],f"{p}.h0")
    op(f"{p}.fc_bias","BIAS_ADD",[f"{p}.h0",f"{p}.fc.b"],f"{p}.h1")
    op(f"{p}.gelu","GELU",[f"{p}.h1"],f"{p}.h2")
    op(f"{p}.out","MATMUL",[f"{p}.h2",f"{p}.out.w"],f"{p}.m0")
    op(f"{p}.out_bias","BIAS_ADD",[f"{p}.m0",f"{p}.out.b"],f"{p}.m1")
    op(f"{p}.res2","ADD",[f"{p}.x1",f"{p}.m1"],f"{p}.x2")
    x=f"{p}.x2"
op("lnf","LAYER_NORM",[x,"lnf.g","lnf.b"],"nf"); op("head","MATMUL",["nf","head.w"],"logits"); op("loss","SOFTMAX_CROSS_ENTROPY",["logits","next"],"loss")
lr = sys.argv[8] if len(sys.argv) > 8 else '0.0003'
o.append('loss: "loss"'); o.append(f'optimizer {{ type: ADAM learning_rate: {lr} beta1: 0.9 beta2: 0.99 epsilon: 1e-8 }}')
print("\n".join(o))
