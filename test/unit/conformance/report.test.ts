/** The conformance ratchet: ginkgo JSON reports in, verdicts and the closing line out. */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  closingLine,
  count,
  formatResults,
  judge,
  parseExpected,
  parseNotApplicable,
  parseReports,
  ratchetFails,
  referenceComparison,
  referenceFailures,
  referenceGap,
  updatedExpected,
} from '../../../scripts/conformance/report.js';
import { packageRoot } from '../../../src/common/paths.js';

const ms = 1_000_000;

function spec(container: string[], leaf: string, state: string, message?: string, runTimeMs = 5) {
  return {
    ContainerHierarchyTexts: container,
    LeafNodeType: 'It',
    LeafNodeText: leaf,
    State: state,
    RunTime: runTimeMs * ms,
    ...(message === undefined ? {} : { Failure: { Message: message, Location: { FileName: 'pkg/validate/x.go', LineNumber: 7 } } }),
  };
}

const VERSION = '[k8s.io] Runtime info runtime should return version info [Conformance]';
const CONDITIONS = '[k8s.io] Runtime info runtime should return runtime conditions [Conformance]';
const HOSTNET = '[k8s.io] Security Context NamespaceOption runtime should support HostNetwork is true';
const START = '[k8s.io] Container runtime should support starting container [Conformance]';
const BENCH = '[k8s.io] PodSandbox benchmark lifecycle';

function report(states: { version?: string; conditions?: string; hostnet?: string; start?: string; hostnetMessage?: string }) {
  return [
    {
      SuiteDescription: 'CRI validation',
      SpecReports: [
        { LeafNodeType: 'BeforeSuite', State: 'passed' },
        spec(['[k8s.io] Runtime info', 'runtime'], 'should return version info [Conformance]', states.version ?? 'passed'),
        spec(
          ['[k8s.io] Runtime info', 'runtime'],
          'should return runtime conditions [Conformance]',
          states.conditions ?? 'failed',
          'should return all the required runtime conditions\nExpected <int>: 1 to be >= <int>: 2',
        ),
        spec(
          ['[k8s.io] Security Context', 'NamespaceOption'],
          'runtime should support HostNetwork is true',
          states.hostnet ?? 'failed',
          states.hostnetMessage ?? 'failed to run pod\nrpc error: code = InvalidArgument desc = network is NODE',
        ),
        spec(
          ['[k8s.io] Container', 'runtime should support'],
          'starting container [Conformance]',
          states.start ?? 'failed',
          'Unimplemented',
        ),
        spec(['[k8s.io] PodSandbox', 'benchmark'], 'lifecycle', 'skipped', undefined, 0),
      ],
    },
  ];
}

const NA = parseNotApplicable(`# comment\n${HOSTNET}\n  reason: the host's network namespace is outside the VM;\n  reason: refused.\n`);

describe('parseReports', () => {
  it('names specs by their full ginkgo text and tells filtered from failed', () => {
    const { specs, suiteProblems } = parseReports([report({})]);
    expect(suiteProblems).toEqual([]);
    expect(specs.map((s) => s.name)).toEqual([VERSION, CONDITIONS, HOSTNET, START, BENCH]);
    const conditions = specs.find((s) => s.name === CONDITIONS)!;
    expect(conditions).toMatchObject({ group: '[k8s.io] Runtime info', state: 'failed', filtered: false, location: 'pkg/validate/x.go:7' });
    expect(conditions.message).toBe('should return all the required runtime conditions Expected <int>: 1 to be >= <int>: 2');
    expect(specs.find((s) => s.name === BENCH)?.filtered).toBe(true);
    expect(closingLine(count(specs), 'standalone')).toBe('conformance (standalone): 1 passed, 3 failed, 1 skipped');
    expect(closingLine(count(specs), 'containerd')).toBe('conformance (containerd): 1 passed, 3 failed, 1 skipped');
  });

  it('merges shard reports: the shard that ran a spec wins over the ones that filtered it', () => {
    const shard1 = report({});
    const shard2 = report({});
    const filteredVersion = shard2[0]!.SpecReports[1]!;
    Object.assign(filteredVersion, { State: 'skipped', RunTime: 0 });
    const { specs } = parseReports([shard2, shard1]);
    expect(specs.find((s) => s.name === VERSION)).toMatchObject({ state: 'passed', filtered: false });
    expect(specs).toHaveLength(5);
  });

  it('reports a failed BeforeSuite as a suite problem', () => {
    const r = report({});
    r[0]!.SpecReports[0] = { LeafNodeType: 'BeforeSuite', State: 'failed', Failure: { Message: 'no runtime' } } as never;
    expect(parseReports([r]).suiteProblems).toEqual([{ node: 'BeforeSuite', state: 'failed', message: 'no runtime' }]);
  });

  it('reports a suite cut short by its timeout as a suite problem', () => {
    const r = report({});
    Object.assign(r[0]!, { SpecialSuiteFailureReasons: ['Interrupted by Timeout'] });
    expect(parseReports([r]).suiteProblems).toEqual([{ node: 'suite', state: 'failed', message: 'Interrupted by Timeout' }]);
  });

  it('refuses a document that is not a ginkgo report', () => {
    expect(() => parseReports([{}])).toThrow(/array of suite reports/);
  });
});

describe('judge (the ratchet)', () => {
  it('holds when every must-pass spec passes, and lists specs that newly pass', () => {
    const { specs } = parseReports([report({ start: 'passed' })]);
    const v = judge(specs, [VERSION], NA);
    expect(ratchetFails(v)).toBe(false);
    expect(v.newlyPassing.map((s) => s.name)).toEqual([START]);
    expect(v.notRefused).toEqual([]);
  });

  it('fails when a must-pass spec fails', () => {
    const { specs } = parseReports([report({ version: 'failed' })]);
    const v = judge(specs, [VERSION], NA);
    expect(ratchetFails(v)).toBe(true);
    expect(v.regressions.map((s) => s.name)).toEqual([VERSION]);
  });

  it('does not judge a must-pass spec the filters left out, but says so', () => {
    const { specs } = parseReports([report({})]);
    const v = judge(specs, [BENCH], NA);
    expect(ratchetFails(v)).toBe(false);
    expect(v.notRun).toEqual([BENCH]);
  });

  it('fails on names critest does not have and on a spec listed as both must-pass and not applicable', () => {
    const { specs } = parseReports([report({})]);
    expect(judge(specs, ['[k8s.io] no such spec'], NA).unknownNames).toEqual(['[k8s.io] no such spec']);
    const v = judge(specs, [HOSTNET], NA);
    expect(v.contradictions).toEqual([HOSTNET]);
    expect(ratchetFails(v)).toBe(true);
  });

  it('flags a not-applicable spec that failed with something other than INVALID_ARGUMENT', () => {
    const { specs } = parseReports([report({ hostnetMessage: 'rpc error: code = Unimplemented desc = StartContainer' })]);
    const v = judge(specs, [], NA);
    expect(v.notRefused.map((s) => s.name)).toEqual([HOSTNET]);
    expect(ratchetFails(v)).toBe(false);
    const lines = formatResults(parseReports([report({})]), v, NA).join('\n');
    expect(lines).toContain(`FAIL ${HOSTNET} [not applicable]`);
    expect(lines).toContain('not refused with INVALID_ARGUMENT');
  });

  it('does not flag a not-applicable spec whose entry says why kata-ts accepts the request', () => {
    const { specs } = parseReports([report({ hostnetMessage: 'len(fileInfo) should not be zero' })]);
    const accepted = parseNotApplicable(`${HOSTNET}\n  reason: half of it cannot work;\n  accepted: the other half does.\n`);
    expect(accepted[0]).toMatchObject({ reason: 'half of it cannot work;', accepted: 'the other half does.' });
    expect(judge(specs, [], accepted).notRefused).toEqual([]);
  });
});

describe('ratchet files', () => {
  it('not-applicable entries need a reason, given as indented reason: lines', () => {
    expect(NA).toEqual([{ name: HOSTNET, reason: "the host's network namespace is outside the VM; refused.", accepted: '' }]);
    expect(() => parseNotApplicable(`${HOSTNET}\n`)).toThrow(/has no reason/);
    expect(() => parseNotApplicable(`${HOSTNET}\n  because\n`)).toThrow(/line 2/);
  });

  it('CONFORMANCE_UPDATE adds names sorted and keeps the comments', () => {
    expect(updatedExpected(`# header\n${VERSION}\n`, [CONDITIONS, VERSION])).toBe(`# header\n${CONDITIONS}\n${VERSION}\n`);
  });

  it('the repository files parse, and no spec is both must-pass and not applicable', () => {
    const dir = path.join(packageRoot(), 'test/conformance');
    const expected = parseExpected(readFileSync(path.join(dir, 'expected.txt'), 'utf8'));
    const na = parseNotApplicable(readFileSync(path.join(dir, 'not-applicable.txt'), 'utf8'));
    const offline = parseNotApplicable(readFileSync(path.join(dir, 'offline-limits.txt'), 'utf8'));
    const listed = new Set([...na, ...offline].map((n) => n.name));
    expect(expected.filter((n) => listed.has(n))).toEqual([]);
    expect(new Set(expected).size).toBe(expected.length);
    expect(expected.every((n) => n.startsWith('[k8s.io] '))).toBe(true);
  });

  it.each([
    ['1.6', 'test/conformance/containerd'],
    ['1.7', 'test/conformance/containerd/1.7'],
    ['2.1', 'test/conformance/containerd/2.1'],
  ])('the containerd %s ratchet parses, and its runc reference lists no spec the offline limits exempt', (_release, rel) => {
    const dir = path.join(packageRoot(), rel);
    const expected = parseExpected(readFileSync(path.join(dir, 'expected.txt'), 'utf8'));
    const reference = parseExpected(readFileSync(path.join(dir, 'runc-reference.txt'), 'utf8'));
    const na = parseNotApplicable(readFileSync(path.join(dir, 'not-applicable.txt'), 'utf8'));
    const offline = parseNotApplicable(readFileSync(path.join(dir, 'offline-limits.txt'), 'utf8'));
    const offlineNames = new Set(offline.map((n) => n.name));
    const listed = new Set([...na.map((n) => n.name), ...offlineNames]);
    expect(expected.filter((n) => listed.has(n))).toEqual([]);
    expect(reference.filter((n) => offlineNames.has(n))).toEqual([]);
    for (const names of [expected, reference]) {
      expect(new Set(names).size).toBe(names.length);
      expect(names.every((n) => n.startsWith('[k8s.io] '))).toBe(true);
    }
  });
});

describe('the runc reference', () => {
  const specs = parseReports([report({})]).specs;
  it('names the reference specs the kata-ts handler ran and failed, apart from the not-applicable ones', () => {
    const failedNames = specs.filter((s) => s.state === 'failed').map((s) => s.name);
    const passedNames = specs.filter((s) => s.state === 'passed').map((s) => s.name);
    expect(failedNames.length).toBeGreaterThan(1);
    const reference = [...failedNames, ...passedNames];
    expect(referenceFailures(specs, reference, []).map((s) => s.name)).toEqual(failedNames);
    const exempt = [{ name: failedNames[0]!, reason: 'a VM cannot', accepted: '' }];
    expect(referenceFailures(specs, reference, exempt).map((s) => s.name)).toEqual(failedNames.slice(1));
    expect(referenceGap(specs, passedNames, [])).toEqual([]);
    expect(referenceGap(specs, reference, exempt).slice(2)).toEqual(failedNames.slice(1).map((n) => `  ${n}`));
  });

  it('compares pass counts over the reference specs that ran: holds only when every non-exempt one passed', () => {
    const failedNames = specs.filter((s) => s.state === 'failed').map((s) => s.name);
    const passedNames = specs.filter((s) => s.state === 'passed').map((s) => s.name);
    const reference = [...failedNames, ...passedNames, '[k8s.io] a reference spec this run did not have'];
    const ran = failedNames.length + passedNames.length;
    expect(referenceComparison(specs, passedNames, [])).toBe(
      `runc comparison holds: kata-ts passed ${passedNames.length} of the ${passedNames.length} runc-reference specs run; needed ${passedNames.length} (${passedNames.length} minus 0 not applicable to a VM)`,
    );
    expect(referenceComparison(specs, reference, [])).toMatch(/^runc comparison FAILS: /);
    const exemptAll = failedNames.map((name) => ({ name, reason: 'a VM cannot', accepted: '' }));
    expect(referenceComparison(specs, reference, exemptAll)).toBe(
      `runc comparison holds: kata-ts passed ${passedNames.length} of the ${ran} runc-reference specs run; needed ${passedNames.length} (${ran} minus ${failedNames.length} not applicable to a VM)`,
    );
    // Exempting one failure is not enough while another non-exempt reference spec failed.
    expect(referenceComparison(specs, reference, exemptAll.slice(1))).toMatch(/^runc comparison FAILS: /);
  });
});
