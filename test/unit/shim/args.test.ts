/**
 * The shim's command line as containerd 1.6-2.x and CRI-O build it, parsed the way Go's flag
 * package parses it, and combined with the environment.
 */
import { describe, expect, it } from 'vitest';
import { parseShimArgs, readShimEnv, ShimUsageError, shimInvocation } from '../../../src/shim/main.js';

const CONTAINERD_16_START = [
  '-namespace',
  'k8s.io',
  '-address',
  '/run/containerd/containerd.sock',
  '-publish-binary',
  '/usr/bin/containerd',
  '-id',
  'abc123',
  '-debug',
  'start',
];

function usage(argv: string[]): string {
  try {
    parseShimArgs(argv);
  } catch (err) {
    expect(err).toBeInstanceOf(ShimUsageError);
    return (err as Error).message;
  }
  throw new Error('no usage error');
}

describe('parseShimArgs', () => {
  it("reads containerd 1.6's start line", () => {
    expect(parseShimArgs(CONTAINERD_16_START)).toMatchObject({
      namespace: 'k8s.io',
      address: '/run/containerd/containerd.sock',
      publishBinary: '/usr/bin/containerd',
      id: 'abc123',
      debug: true,
      bundle: '',
      action: 'start',
    });
  });

  it("reads containerd's delete line (with -bundle) and 2.x's -socket", () => {
    const args = parseShimArgs(['-namespace', 'default', '-address', 'a', '-publish-binary', 'b', '-id', 'x', '-bundle', '/b/x', 'delete']);
    expect(args).toMatchObject({ bundle: '/b/x', action: 'delete', debug: false });
    expect(parseShimArgs(['-socket', '/run/s', '-id', 'x', 'serve'])).toMatchObject({ socket: '/run/s', action: 'serve' });
  });

  it('takes -flag=value, --flag value and boolean values as Go does', () => {
    expect(parseShimArgs(['--id', 'x', '-namespace=ns', '-debug=false', 'start'])).toMatchObject({
      id: 'x',
      namespace: 'ns',
      debug: false,
    });
    expect(parseShimArgs(['-debug=1', '-v'])).toMatchObject({ debug: true, version: true, action: '' });
    // A boolean flag takes no separate value: "false" is the action.
    expect(parseShimArgs(['-debug', 'false']).action).toBe('false');
  });

  it('stops at the first non-flag or after --; later words are not flags', () => {
    expect(parseShimArgs(['-id', 'x', 'start', '-bogus'])).toMatchObject({ action: 'start' });
    expect(parseShimArgs(['-id', 'x', '--', '-start'])).toMatchObject({ action: '-start' });
    expect(parseShimArgs(['-', 'start']).action).toBe('-');
    // A flag's value may look like a flag.
    expect(parseShimArgs(['-id', '-x', 'start']).id).toBe('-x');
  });

  it('names the flag of every mistake', () => {
    expect(usage(['-bogus', 'start'])).toBe('flag provided but not defined: -bogus');
    expect(usage(['-id'])).toBe('flag needs an argument: -id');
    expect(usage(['-debug=maybe'])).toBe('invalid boolean value "maybe" for -debug');
    expect(usage(['---id', 'x'])).toBe('bad flag syntax: ---id');
    expect(usage(['-=x'])).toBe('bad flag syntax: -=x');
  });

  it('-h and -help ask for the usage', () => {
    expect(parseShimArgs(['-h']).help).toBe(true);
    expect(parseShimArgs(['-id', 'x', '-help', '-bogus']).help).toBe(true);
  });
});

describe('shimInvocation', () => {
  const env = readShimEnv({});

  it('resolves the bundle against the working directory and the address from GRPC_ADDRESS', () => {
    const inv = shimInvocation(
      parseShimArgs(['-namespace', 'ns', '-id', 'x', 'start']),
      readShimEnv({ GRPC_ADDRESS: '/g.sock' }),
      '/bundles/x',
    );
    expect(inv).toMatchObject({ action: 'start', bundle: '/bundles/x', containerdAddress: '/g.sock', namespace: 'ns' });
    const flagWins = shimInvocation(
      parseShimArgs(['-namespace', 'ns', '-address', '/a.sock', '-id', 'x', 'start']),
      readShimEnv({ GRPC_ADDRESS: '/g.sock' }),
      '/',
    );
    expect(flagWins.containerdAddress).toBe('/a.sock');
  });

  it('takes the namespace from NAMESPACE when the flag is absent (containerd 2.x)', () => {
    const inv = shimInvocation(parseShimArgs(['-id', 'x', 'delete']), readShimEnv({ NAMESPACE: 'k8s.io' }), '/b');
    expect(inv.namespace).toBe('k8s.io');
  });

  it('refuses a missing action, namespace, id or serve socket, and unknown actions, naming each', () => {
    const inv = (argv: string[]) => () => shimInvocation(parseShimArgs(argv), env, '/');
    expect(inv(['-namespace', 'n', '-id', 'x'])).toThrow('an action is required: start, delete, serve');
    expect(inv(['-namespace', 'n', '-id', 'x', 'boot'])).toThrow('unknown action "boot"');
    expect(inv(['-id', 'x', 'start'])).toThrow('-namespace is required');
    expect(inv(['-namespace', 'n', 'start'])).toThrow('-id is required');
    expect(inv(['-namespace', 'n', '-id', 'x', 'serve'])).toThrow('-socket is required for serve');
    expect(inv(['-namespace', 'n', '-id', 'x', '-socket', 'rel', 'serve'])).toThrow('-socket must be an absolute path');
  });
});

describe('readShimEnv', () => {
  it('reads the variables containerd sets', () => {
    expect(
      readShimEnv({
        TTRPC_ADDRESS: '/run/containerd/containerd.sock.ttrpc',
        GRPC_ADDRESS: '/run/containerd/containerd.sock',
        NAMESPACE: 'k8s.io',
        MAX_SHIM_VERSION: '2',
        SCHED_CORE: '1',
        KATA_TS_CONFIG: '/etc/x.json',
      }),
    ).toEqual({
      ttrpcAddress: '/run/containerd/containerd.sock.ttrpc',
      grpcAddress: '/run/containerd/containerd.sock',
      namespace: 'k8s.io',
      maxShimVersion: 2,
      schedCore: true,
      configPath: '/etc/x.json',
    });
    expect(readShimEnv({ MAX_SHIM_VERSION: 'x' })).toMatchObject({ maxShimVersion: null, schedCore: false, configPath: undefined });
  });
});
