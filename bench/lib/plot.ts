/**
 * Line charts rendered to SVG inside Node by Vega (no browser, no canvas, no network: the spec
 * carries its data inline), for the benches that publish curves in docs/.
 */
import { parse, type Spec, View } from 'vega';

/** One curve: a name for the legend and its (x, y) points; y NaN points are left out. */
export interface Series {
  name: string;
  points: ReadonlyArray<{ x: number; y: number }>;
  /** Drawn dashed (a reference, not one of the measured modes). */
  dashed?: boolean;
}

export interface LineChart {
  title: string;
  xTitle: string;
  yTitle: string;
  series: readonly Series[];
  /** Ticks of the x axis (the pod counts measured). */
  xTicks: readonly number[];
  /** Small print under the title (the run it comes from). */
  subtitle?: string;
  width?: number;
  height?: number;
}

/** The Vega spec of a line chart with points, a legend and the given x ticks. Pure. */
export function lineChartSpec(chart: LineChart): Spec {
  const rows = chart.series.flatMap((s) =>
    s.points.filter((p) => Number.isFinite(p.y)).map((p) => ({ series: s.name, x: p.x, y: p.y, dashed: s.dashed === true })),
  );
  return {
    $schema: 'https://vega.github.io/schema/vega/v6.json',
    width: chart.width ?? 520,
    height: chart.height ?? 280,
    padding: 8,
    background: 'white',
    title: { text: chart.title, ...(chart.subtitle === undefined ? {} : { subtitle: chart.subtitle }), anchor: 'start' },
    data: [{ name: 'rows', values: rows }],
    scales: [
      { name: 'x', type: 'linear', domain: [0, Math.max(...chart.xTicks) + 0.5], range: 'width', nice: false, zero: true },
      { name: 'y', type: 'linear', domain: { data: 'rows', field: 'y' }, range: 'height', nice: true, zero: true },
      { name: 'color', type: 'ordinal', domain: chart.series.map((s) => s.name), range: 'category' },
    ],
    axes: [
      { orient: 'bottom', scale: 'x', title: chart.xTitle, values: [...chart.xTicks], format: 'd', grid: true },
      { orient: 'left', scale: 'y', title: chart.yTitle, grid: true },
    ],
    legends: [{ fill: 'color', stroke: 'color', orient: 'right', symbolType: 'stroke', labelLimit: 260 }],
    marks: [
      {
        type: 'group',
        from: { facet: { name: 'one', data: 'rows', groupby: 'series' } },
        marks: [
          {
            type: 'line',
            from: { data: 'one' },
            sort: { field: 'datum.x' },
            encode: {
              enter: {
                x: { scale: 'x', field: 'x' },
                y: { scale: 'y', field: 'y' },
                stroke: { scale: 'color', field: 'series' },
                strokeWidth: { value: 2 },
                strokeDash: { signal: 'datum.dashed ? [6, 4] : [1, 0]' },
              },
            },
          },
          {
            type: 'symbol',
            from: { data: 'one' },
            encode: {
              enter: {
                x: { scale: 'x', field: 'x' },
                y: { scale: 'y', field: 'y' },
                fill: { scale: 'color', field: 'series' },
                size: { value: 36 },
              },
            },
          },
        ],
      },
    ],
  };
}

/** Renders the chart to an SVG document (Vega's headless SVG renderer). */
export async function lineChartSvg(chart: LineChart): Promise<string> {
  const view = new View(parse(lineChartSpec(chart)), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}
