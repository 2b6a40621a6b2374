"""Instructions per iteration of a kernel's loop along one path, from `cuobjdump -sass` text (how the decode attention
per-tile counts in docs/benchmarks_gpu.md were made).
  python3 tools/sass_loop_path.py loops FILE.sass             loops (backward branches) holding >= 8 HMMA, their size
  python3 tools/sass_loop_path.py branches FILE.sass LO HI    the loop's conditional branches with their predicate's setter
  python3 tools/sass_loop_path.py path FILE.sass LO HI TAKEN [-v]
      walk LO..HI taking the conditional branches at the comma-separated addresses TAKEN (others fall through) and
      print the instruction count and opcode histogram of that path (-v: the path itself)."""
import collections
import re
import sys


def parse(path):
    text = open(path).read()
    return [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]


def opcode(ins):
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", ins).split()[0].split(".")[0]


def histogram(body):
    ops = collections.Counter(opcode(t) for _, t in body)
    return " ".join(f"{k}:{v}" for k, v in ops.most_common())


def main():
    cmd, ins = sys.argv[1], parse(sys.argv[2])
    at = {a: i for i, (a, _) in enumerate(ins)}
    if cmd == "loops":
        for i, (a, t) in enumerate(ins):
            m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", t)
            if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
                body = ins[at[int(m.group(1), 16)]:i + 1]
                if sum(opcode(x) == "HMMA" for _, x in body) >= 8:
                    print(f"loop {int(m.group(1), 16):#x}-{a:#x}: {len(body)} instructions\n  {histogram(body)}")
        return
    lo, hi = int(sys.argv[3], 16), int(sys.argv[4], 16)
    if cmd == "branches":
        setter = {}
        for a, t in ins:
            if lo <= a <= hi:
                if re.search(r"SETP|VOTE|PLOP3", t):
                    for p in re.findall(r"\b(U?P\d)\b", ",".join(t.split(",")[:2])):
                        setter[p] = t
                if "BRA" in t and t.startswith("@"):
                    p = re.match(r"@!?(U?P\d)", t).group(1)
                    print(f"{a:#06x} {t:30s} <- {setter.get(p, '(set before the loop)')[:70]}")
        return
    taken = {int(x, 16) for x in sys.argv[5].split(",") if x}
    i, path = at[lo], []
    while len(path) < 10000:
        a, t = ins[i]
        path.append((a, t))
        if a == hi:
            break
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", t)
        if m and (not t.startswith("@") or a in taken):
            i = at[int(m.group(1), 16)]
            continue
        i += 1
    print(f"{len(path)} instructions: {histogram(path)}")
    if "-v" in sys.argv:
        for a, t in path:
            print(f"{a:#06x} {t}")


if __name__ == "__main__":
    main()
