// Generate TypeScript declarations for proto/api.proto into src/generated/ (git-ignored), the
// guest agent API's types and embedded schema into src/generated/agent/ (scripts/gen-agent-types.mjs),
// and containerd's shim protocol into src/generated/containerd/ (scripts/gen-containerd-types.mjs).
// The options must match PROTO_LOADER_OPTIONS in src/cri/proto.ts, because the
// declarations describe the objects that loader produces at run time.
import { spawnSync } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateAgentTypes } from './gen-agent-types.mjs';
import { generateContainerdTypes } from './gen-containerd-types.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = path.join(root, 'src/generated');
const proto = path.join(root, 'proto/api.proto');
if (!existsSync(proto)) {
  console.error(`gen: ${proto} is missing`);
  process.exit(1);
}
rmSync(out, { recursive: true, force: true });
const bin = path.join(root, 'node_modules/.bin/proto-loader-gen-types');
// The .proto file goes first: -I is an array option and would swallow a file named after it.
// NodeNext resolution needs explicit `.js` suffixes on the generated relative imports.
const args = [
  'api.proto',
  '--keepCase',
  '--longs=String',
  '--enums=String',
  '--defaults',
  '--oneofs',
  '--grpcLib=@grpc/grpc-js',
  '--importFileExtension=.js',
  `--outDir=${out}`,
  `-I=${path.join(root, 'proto')}`,
];
const res = spawnSync(bin, args, { stdio: 'inherit', cwd: root });
if (res.status !== 0) process.exit(res.status ?? 1);
generateAgentTypes(root, out);
generateContainerdTypes(root, out);
